"""Example workflows and activities: a three-step order pipeline and the checkout saga."""
