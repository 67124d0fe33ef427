"""The one-command GPU check (scripts/gpu_check.sh): each module is one step."""
