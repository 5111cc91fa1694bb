"""Tools on top of the studio: ``screenshots`` (the README's pictures, from a real browser) and
``overhead`` (what the studio's streaming costs a run)."""
