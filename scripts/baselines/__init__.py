"""Baselines tokenrouterd is measured against: research-code loop, standard serving."""
