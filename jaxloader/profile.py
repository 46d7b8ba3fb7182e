"""``python -m jaxloader.profile module:make_loader --steps 300``: the profile report from the
command line (``jaxloader.profiling``; in Python, ``jl.profile``)."""

from jaxloader.profiling import main

if __name__ == "__main__":
    main()
