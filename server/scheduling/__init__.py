"""Which waiting request goes next, and which running one gives way: first come first served,
priorities with aging, or fair shares between users."""
