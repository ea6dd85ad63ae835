"""What is sharded: table pools, synthetic index streams, tasks, and statistics of users' own data."""
