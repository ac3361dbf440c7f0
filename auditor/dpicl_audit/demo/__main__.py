"""``python -m dpicl_audit.demo``: the demo (:mod:`.main`)."""

from dpicl_audit.demo.main import main

# Guarded, so that importing every module (the test that the auditor never imports the
# server walks the package) does not start the demo.
if __name__ == "__main__":
    raise SystemExit(main())
