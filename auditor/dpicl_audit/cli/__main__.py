"""``python -m dpicl_audit.cli``."""

from dpicl_audit.cli import main

if __name__ == "__main__":
    main()
