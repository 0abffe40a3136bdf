"""Pure domain model: principals, commands, the task aggregate and its lifecycle rules."""
