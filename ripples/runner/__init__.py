"""The command line: ``ripplesrun`` (``launch.py``, with elastic restarts in
``elastic_restart.py``) and the ``ripples`` command (``info.py``: ``ripples info``,
``ripples sim``)."""
