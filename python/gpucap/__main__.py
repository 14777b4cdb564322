"""``python -m gpucap ARGS`` runs the ``gpucap`` command with ARGS."""

from . import main

if __name__ == "__main__":
    main()
