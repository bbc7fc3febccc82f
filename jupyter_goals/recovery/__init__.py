"""Recovery: pure history repair and the Coordinator's recovery decisions."""
