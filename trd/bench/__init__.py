"""`tokenrouterd bench`: measuring any OpenAI-compatible server, and the systems we compare.

stats.py     the one percentile and the summary every result uses
result.py    the one result schema (command, commit, machine, systems, runs)
datasets.py  the prompt sets (chat, code, agent, random, jsonl:PATH), seeded
client.py    the one load client: streamed OpenAI-compatible requests, timed
load.py      closed or open loop over conversations, against a client or an in-process
             system; record.py: the one per-request record
serve.py     `tokenrouterd bench serve`: the client against a URL, a table, the JSON
"""
