"""`python -I -S <this file>`: the launcher (launcher.py), with the jail's own modules importable.

-I leaves the script's folder off sys.path; the folder above this one goes at its end, so the standard
library always wins and `jail` (standard library only, like its siblings here) is importable.
"""

import os
import sys

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from jail.launcher import main  # noqa: E402

sys.exit(main())
