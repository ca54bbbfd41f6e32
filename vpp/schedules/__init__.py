"""What runs when: layouts (stage -> rank), the schedule IR, plan builders, verifier, simulator,
executor and traces."""
