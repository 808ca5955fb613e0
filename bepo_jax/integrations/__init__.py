"""Adapters to other trainers' batch layouts."""
