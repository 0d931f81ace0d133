"""eagle3ops: train and ship an EAGLE-3 draft head for a model served with vLLM, on your own GPU hosts.

The package is split by job (see ARCHITECTURE.md): ``config`` validates inventories, ``commands`` builds remote
commands as argv lists, ``remote`` runs them over Fabric, ``window`` orchestrates a maintenance window,
``supervisor`` runs it on the host, ``stages`` are the in-container pipeline steps, ``patches`` manages the patch
series, ``images`` builds versioned images and ``transfer`` pushes them over SSH.
"""

__version__ = "0.1.0"
