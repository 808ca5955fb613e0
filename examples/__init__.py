"""Examples run by the tests (README, "Bring your own environment")."""
