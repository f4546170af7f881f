"""What tests share, each in one place; a test module is never imported by another.

- ``processes``: running the console scripts as real processes, ``wait_for``, ports, ``status``, ``ctl``.
- ``etcd``: starting real etcd members (``EtcdServer``, ``start_etcd``); conftest's fixtures use it.
- ``chains``: the chains test app's sizes, its exact-result check and its cluster-mode command lines.
- ``errors``: how a test checks that an error is one clear line.
- ``inprocess``: an app's Driver and Executors run in this process, without the runtime.
- ``handbuilt``: Worker, Server and Master objects built without sockets, for unit tests of their handlers.
- ``badapps``: small apps written into a test's directory and run, for tests of what bad apps do.
- ``reference``: the scikit-learn references the apps' results are checked against.
"""
