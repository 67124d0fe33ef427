"""Quality evaluations, `tokenrouterd eval ...` (`cli.py` lists them): HumanEval against any
OpenAI-compatible server, the routing policies' quality against cost, structured
outputs, the demo pair's answers, and the threshold that gives a policy a target share."""
