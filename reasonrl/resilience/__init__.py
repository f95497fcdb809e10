"""Training that survives faults: guards in the step, fault injection for drills, the supervisor around the trainer."""
