"""Engines on other hosts: the daemon's link to each (`link`), the host that runs one
(`host`, `tokenrouterd engine`), and what they agree on when they meet (`card`)."""
