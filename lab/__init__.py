"""The lab: the demo handler, the crash test, the durability demo, the local broker."""
