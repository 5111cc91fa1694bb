"""Tools on top of the studio: ``screenshots`` (the README's pictures, from a real browser),
``overhead`` (what the studio's streaming costs a run), ``crowd`` (many visitors on one shared studio)
and ``first_load`` (where the time goes between starting the studio on a model and its first run)."""
