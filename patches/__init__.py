"""Opt-in runtime patches to ROLL where its extension surface is closed (see LEDGER.md)."""
