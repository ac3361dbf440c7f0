"""dpicl: differentially private in-context learning server.

"Paper 000", "paper 003" and "paper 004" in the docstrings are the three papers the project
implements (Xia, Liu, Xiong 2025; Chadha et al., ICML 2024; Flemings et al. 2025, DPS-MOZO);
docs/references.md gives their full citations and every other work cited.
"""

__version__ = "0.1.0"
