"""Engines on other hosts: the daemon's link to each (`link`), the host that runs one
(`host`, `tokenrouterd engine`), what they agree on when they meet (`card`, `handshake`),
and the transport between them (`tcp` framing, `envelope`, the `bridge` between a host's
rings and the connection). Below the supervisor: nothing here imports it."""
