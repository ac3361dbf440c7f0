"""``python -m dpicl_audit.demo``: the demo (:mod:`.main`)."""

from dpicl_audit.demo.main import main

raise SystemExit(main())
