"""The real OpenStack test cloud of tests/openstack/cloud.py, by part:
[config] settings and helpers, [identity] Keystone and Barbican, [infra]
MariaDB, RabbitMQ and the network stub, [block] Cinder and Nova, [file]
Ceph, NFS-Ganesha and Manila."""
