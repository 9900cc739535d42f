"""``python -m locos_tl.organisms.train``: the training command line, which lives in
:mod:`locos_tl.organisms.recipes` (also ``locos train-organism``)."""

if __name__ == "__main__":  # importing this module trains nothing
    from locos_tl.organisms.recipes import main

    raise SystemExit(main())
