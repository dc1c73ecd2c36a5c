"""The grader (docs/design.md section 4): static rules, isolated evaluation, correctness, enforcement, timing."""
