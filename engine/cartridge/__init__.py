"""Documents attached to chats as KV cartridges (spec 13.10): `ingest` reads a file as text, `build` turns it
into a `cartridge` (its KV rows from one real prefill) and attaches it, `store` keeps cartridges on disk."""
