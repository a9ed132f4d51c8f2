"""The fault suite: one test per case of a careful user's or a hostile input's misuse (see
CONTRIBUTING.md, "What each surface promises on bad input"), grouped by surface."""
