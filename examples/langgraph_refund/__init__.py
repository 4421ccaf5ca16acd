"""A LangGraph refund graph whose payment tool is a recorded effect (issue 10, item 3)."""
