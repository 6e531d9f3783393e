"""Model formats loopnet reads and writes."""
