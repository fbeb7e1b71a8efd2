"""ColossalAI backend (runs in .venvs/colossal, see scripts/setup-env-colossal.sh)."""
