"""Method ``ssr-exit``: SSR whose drafts, as they finish, also decide when to stop reasoning (lossy).

``rule``: the agreement rule and the answer key; ``budget``: the hook on SSR's loop and the method.
"""
