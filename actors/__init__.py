"""Ray actors and tasks: thin shells around engine/ and solvers/."""
