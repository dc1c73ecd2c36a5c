"""The grader (DESIGN.md section 4): static rules, isolated evaluation, correctness, enforcement, timing."""
