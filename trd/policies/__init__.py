"""Routing policies: `factory.make_policy` builds one by name; `params` checks its parameters.

This package's import is light on purpose: the supervisor checks policy parameters
(`params`) without loading torch; only the engines import the policies themselves.
"""
