"""Goals: lifecycle rules (pure), state tools and the turn hooks the turn loop calls."""
