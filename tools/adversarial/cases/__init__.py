"""Case files of the adversarial harness: one module a surface, each defining CASES."""
