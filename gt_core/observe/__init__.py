"""What gt tells (torch-free): events, the report, causes with fixes, metrics."""
