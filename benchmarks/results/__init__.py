"""The scripts behind the docs' result tables.

``run`` (closed-book and RAG sets, with ``closed_book``, ``rag`` and ``sequential``),
``cascade`` and ``decisions``.
"""
