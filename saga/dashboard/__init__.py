"""``saga dashboard``: web pages for operators over one or more services' databases."""
