"""The adversarial harness (tools/adversarial/README.md): hostile and careless inputs, each under a timeout
and a memory cap, with fake secrets in the environment."""
