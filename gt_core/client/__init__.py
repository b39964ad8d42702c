"""The client, in the kernel's process: proxies, recording, plans followed, the session, jit.

A proxy's class (``proxy.Proxy``) names each of its behaviours in its body: its ops are
recorded (``__torch_dispatch__`` calls ``record``, passing the class), pickling, copies and
moves are ``tensor_io``'s. The modules below it take the class from their caller and never
import it, so importing any client module gives whole proxies.
"""
