"""What the plan names, below the plan and every mechanism's folder.

==================  ============================================================
module              what it holds
==================  ============================================================
:mod:`.settings`    what every mechanism's settings share (the plan's ``[mechanism]``)
:mod:`.mechanisms`  the one list of mechanisms: each one's settings model loaded by
                    name, the built-in ones as those of entry points
:mod:`.attacks`     the attacks: threat models, source, the mechanisms taking each;
                    the plan's ``Attack`` names derived from them
==================  ============================================================
"""
