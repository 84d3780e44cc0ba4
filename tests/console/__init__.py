"""The dead-letter console in a real headless Chromium (selenium driving Debian's chromium-driver)."""
