import os
import sys

# Tests import the package from the source tree even when it is not installed.
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
sys.path.insert(0, os.path.dirname(__file__))
