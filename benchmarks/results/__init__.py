"""The scripts behind the docs' result tables.

``run`` (closed-book and RAG sets, with ``closed_book`` and ``rag``), ``cascade`` and
``decisions``.
"""
