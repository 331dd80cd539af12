"""The project's container images, built with buildah (`make images`) and checked as the pods run them.

`make check-images` runs every step inside its image as its pod runs it. The Dockerfiles beside this package are
what a user's CI builds with docker; these modules are how this repository builds and checks them without a
Docker daemon.
"""
