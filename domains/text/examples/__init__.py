"""The embedded assets and demos: the small trained pair (``pair.py``, weights in ``weights/``), its byte
tokenizer and corpus (``tokenizer.py``, ``corpus.py``), the speech pair (``speech.py``) and the demos
(``demo.py``, ``speech_demo.py``: ``speculate demo text`` / ``speech``)."""
