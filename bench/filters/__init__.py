"""Filtered search: filters at scale, the planner's crossovers, row masks, and bounded requests."""
