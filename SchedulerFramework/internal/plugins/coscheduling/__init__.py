"""Coscheduling: all-or-nothing gang scheduling of JobSets and pod groups."""
