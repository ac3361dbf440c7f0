"""Old path of :mod:`dpicl.mechanisms.dps_mozo.offline`
(moved into its mechanism's folder, issue 28).

Importing this path gives that module itself, so code written against the old layout (a
positive control that patches a pipeline's names) reaches the module the server runs.
"""

import sys

from dpicl.mechanisms.dps_mozo import offline as _moved

sys.modules[__name__] = _moved
