"""The attempt loop (issue 4): litellm client, tools, budgets, skills, plan and scheduler."""
