"""Embedding the turns: the append path's client and writer, the API's inline embedder,
the recovery pass.

The conversation ops load first: their package imports this one's client, and the
client imports ``loom.ops.conversation.common``, which would otherwise start that
package half-way through the client (a circular import whenever a module of this
package is the first of the two to load, as the worker's embed jobs are).
"""

import loom.ops.conversation  # noqa: F401
