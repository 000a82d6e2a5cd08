"""The controller: leader election, scheduling passes and failure detection."""
